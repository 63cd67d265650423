"""serve component of mmgate (see DESIGN.md)."""
