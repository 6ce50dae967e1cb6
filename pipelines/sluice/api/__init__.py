"""sluice's API, free of Spark: the StreamingApp spec model (`app`), the pipeline DAG (`pipeline`), the one
operator -> driver contract (`contract`: the RunnerConfig and the control API's messages), the checks that
need no JVM (`validation`, `sqlcheck`). The operator imports this package and never `sluice.pipelines`; the
runner imports both."""
