"""The driver control API: /metrics, /healthz, GET /v1/status and PUT /v1/executors on the control port.

Modules: `server` (the HTTP server and routes), `auth` (bearer token), `executors` (live executor changes
through Spark's scheduler), `status` (DriverStatus) and `backlog` (Kafka backlog from query progress).
"""
