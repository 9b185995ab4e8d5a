"""TIDE's released implementation, beside the engine: the checkout check (checkout) and the adapter that runs
it on the bench's cells (adapter). It imports only the bench and the settings."""
