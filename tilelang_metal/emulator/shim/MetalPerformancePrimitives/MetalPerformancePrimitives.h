// tilelang_metal emulator: MetalPerformancePrimitives subset (see tlm/mpp.h).
#pragma once
#include "../tlm/mpp.h"
