"""A module of the consumer's own top-level `tools` package (recurrent_lowering has one too)."""

OWNER = "consumer_example"
