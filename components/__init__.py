"""KFP components: one thin adapter per stage over ``ac2_core.stages.<stage>.run``.

Each component imports inside its body, passes ``artifact.path`` values as the stage's
URIs, and copies the stage's returned metrics into its output artifacts' metadata
(``components.io``). No component holds logic; this package imports nothing heavy.
"""
