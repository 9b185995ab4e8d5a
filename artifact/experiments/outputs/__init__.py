"""What a run leaves behind: where its outputs go (paths) and its figures, saved with the data they drew
(figures); a stored run's manifest (manifest); the commits that changed a rule file after the stored runs were
recorded (rule_history)."""
