"""An iteration cost for simulated workers in control-plane tests: every iteration and
decode step takes ``seconds`` whatever it computes."""


class FlatCost:
    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds

    def iteration_time(self, prefills, decode_contexts):
        return self.seconds

    def decode_time(self, batch_size, total_context):
        return self.seconds

    def decode_times(self, batch_size, total_context, steps):
        return [self.seconds] * steps
