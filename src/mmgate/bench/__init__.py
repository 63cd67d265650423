"""bench component of mmgate (see DESIGN.md)."""
