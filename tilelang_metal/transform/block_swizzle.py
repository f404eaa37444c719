"""placeholder"""
SWIZZLE_ATTR = "tilelang_metal.mlx_swizzle"
def PadGridForMLXSwizzle():
    return lambda mod: mod
