"""api component of mmgate (see DESIGN.md)."""
