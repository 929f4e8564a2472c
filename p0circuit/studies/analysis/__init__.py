"""The paper's questions for any model in one call: :func:`analyze` (``p0circuit analyze``)."""

from p0circuit.studies.analysis.run import Analysis, AnalysisSettings, analyze

__all__ = ["Analysis", "AnalysisSettings", "analyze"]
