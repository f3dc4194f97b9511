"""The broker's references: bounds on what a forecast could reach, node placement for the
simulator, load shapes, and the throughput learner's closed-loop replay."""
