"""The swactor codegen: ``fsm/*.yaml`` tables -> typed machines, diagrams and tests.

Run ``python -m codegen --help``. Modules: ``yamlmarks`` (YAML with line numbers),
``loader`` + ``graph`` + ``fieldtypes`` (validation into ``model.Table``; every refusal is
an ``errors.TableError``), ``pymachine``, ``dot`` and ``pytests`` (the three writers, with
``exprs`` for effect expressions, ``pretty`` for layout and ``templating`` for the jinja2
templates in ``templates/``), ``generate`` (plan/write/check), ``svg`` (Graphviz), and
``reference`` (the ``transitions`` interpreter the generated tests compare against).
"""
