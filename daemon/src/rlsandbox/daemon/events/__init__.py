"""State and reward events over NATS JetStream, and the aggregator (docs/events.md)."""
