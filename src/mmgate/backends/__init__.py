"""backends component of mmgate (see DESIGN.md)."""
