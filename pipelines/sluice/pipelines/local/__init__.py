"""Real components for local runs (`sluice run`, `make demo`): the developer Kafka broker, small Kafka
client helpers, the Spark Kafka connector jars and the provisioning plumbing under them. The test bed
(sluice.testbed) builds on these; nothing here imports it."""
