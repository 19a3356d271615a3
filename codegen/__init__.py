"""The swactor codegen: ``fsm/*.yaml`` tables -> typed machines, diagrams and tests.

Run ``python -m codegen --help``. Modules: ``yamlmarks`` (YAML with line numbers),
``loader`` + ``graph`` (validation into ``model.Table``), ``pymachine``, ``dot`` and
``pytests`` (the three writers), ``generate`` (plan/write/check), ``svg`` (Graphviz),
``reference`` (the ``transitions`` interpreter the generated tests compare against).
"""
