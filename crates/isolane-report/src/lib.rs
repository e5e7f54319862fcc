//! isolane-report: tables, CSV/JSON, SVG plots, the HTML report.
