"""TIDE's released implementation, beside the engine: the checkout check (checkout), TIDE's model driven
(released) and the adapter that runs it beside the engine on the bench's cells (adapter). It imports only
the bench and the settings."""
