"""routing component of mmgate (see DESIGN.md)."""
