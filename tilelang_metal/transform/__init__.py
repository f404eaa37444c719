"""Plugin-owned TIR passes of the Metal pipeline."""
