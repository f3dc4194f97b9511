"""Pure compilers from a validated ``PipelineSpec`` to engine-shaped plans."""
