"""reuse component of mmgate (see DESIGN.md)."""
