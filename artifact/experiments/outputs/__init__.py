"""What a run leaves behind: where its outputs go (paths) and its figures, saved with the data they drew
(figures)."""
