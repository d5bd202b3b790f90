"""Tasks defined outside ``agent_r1/``, trained by the same pipeline through params alone.

Each module here is what a user writes in their own package: a tool, a reward and
a data source, named in ``params.yaml`` as ``package.module:Name`` plugins.
"""
