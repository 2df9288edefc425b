"""The three stages and what they share: data, models, precision, metrics."""
