"""The cache's policies: what to prefetch, which expert to evict, and the user's own policy modules."""
