"""The orchestration layer: the commands that start distributed work, settings resolution (flags > YAML > defaults),
the launch (own elastic launcher or one rank under torchrun), and each job as a short list of named phases.

Nothing below this package imports it."""
