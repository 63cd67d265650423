"""sim component of mmgate (see DESIGN.md)."""
