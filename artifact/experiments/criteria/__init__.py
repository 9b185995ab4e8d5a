"""What a claim is judged against: the paper's numbers (paper) and this artifact's thresholds (thresholds)."""
