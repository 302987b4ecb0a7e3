"""What the predictor offers outside its service (`crater predict`): the estimate alone."""

from crater.predictor.domain.estimate import Refused, predict

__all__ = ["Refused", "predict"]
