"""The plugin's MSL code generator (registered as a TVM global, returns a stock source module)."""
