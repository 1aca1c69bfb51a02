"""Which fleet to buy: capacity and cost planning (``hetflow capacity``; docs/capacity.md)."""
