"""Your own tools, rewards, action formats, data sources and advantage estimators.

Write them in modules here and name them in ``params.yaml`` as ``plugins.module:Name``
(``env.tools``, ``env.reward.scheme``, ``env.format``, ``data.source``, ``algorithm.name``):
``dvc repro`` imports and checks them, and re-runs the stages that use them when
this folder changes (it is their dep: ``plugins.code``). ``examples/`` shows a whole
task built this way.
"""
