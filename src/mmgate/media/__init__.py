"""media component of mmgate (see DESIGN.md)."""
