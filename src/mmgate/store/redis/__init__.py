"""redis component of mmgate (see DESIGN.md)."""
