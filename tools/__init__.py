"""Tools that read the project itself: its imports (``imports``), the rule they follow (``import_rules``) and
the diagram drawn from them (``architecture_diagram``, ``python -m tools.architecture_diagram``).

May import: the standard library and ``tools`` only; nothing here imports the code it reads.
"""
