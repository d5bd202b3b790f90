"""Your own tools, rewards, action formats, data sources and advantage estimators.

Write them in modules here and name them in ``params.yaml`` as ``plugins.module:Name``
(``env.tools``, ``env.reward.scheme``, ``env.format``, ``data.source``, ``algorithm.name``):
``dvc repro`` imports and checks them, and re-runs the stages that use them when
this folder changes (it is their dep: ``plugins.code``). Settings of a plugin's own
are declared as its ``Options`` and written under ``env.tool_options.<tool name>``,
``env.reward.options``, ``data.options`` or ``algorithm.options``.

:mod:`plugins.rewards` (an EM/F1 reward with a ``weight``) is a small one with options;
``examples/`` shows a whole task built this way, its calculator tool with options
(``digits``) and a process reward of its own.
"""
