"""pipeline layer of the workbook helpers (see DESIGN.md)."""
