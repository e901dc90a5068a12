//! What fencelock reports: tracing spans and events, and metrics (placeholder, filled below).
