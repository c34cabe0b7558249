"""Views of a trace or report for a person: text and self-contained HTML pages."""
