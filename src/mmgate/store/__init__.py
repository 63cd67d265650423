"""store component of mmgate (see DESIGN.md)."""
