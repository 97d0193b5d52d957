# TEMPORARY placeholder (replaced by the optimize pipeline work)
import dataclasses
@dataclasses.dataclass
class OptimizationReport:
    matches: dict = dataclasses.field(default_factory=dict)
def optimize_model(model, ep="default", dtype=None, model_role="decoder", trace=False):
    return OptimizationReport()
