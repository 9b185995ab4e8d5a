"""Routing traces and their replay without the model: exact counts, the demand-paging floor, synthetic
streams."""
