"""What a run leaves behind: where its outputs go (paths) and its figures, saved with the data they drew
(figures); a stored run's manifest (manifest), its provenance (provenance) and the stored runs on disk
(stored_runs)."""
