"""One training step of N policies, as plain functions (no Lightning): rollouts, scoring, dynamic sampling, exchange,
plans, updates, weight sync, and the typed report it returns."""
