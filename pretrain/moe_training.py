"""What a mixture of experts adds to the training loop: the load-balancing loss, the routing figures and
DeepSeek-V3's routing-bias balancing, owned by one object the trainer calls at four points.

- ``add_aux_loss`` around each forward (``compute_loss``): ``aux_loss_coef`` x the load-balancing loss
  (``pretrain.routing.RouterWatch``);
- ``after_step`` once per optimizer step (``_maybe_log_save_evaluate``): the step's expert loads and, on an
  applied step, the bias update (``pretrain.bias_balancing``);
- ``record`` at each training log record: the routing figures;
- ``restore`` / ``write``: the routing records in each checkpoint (the run-state protocol of
  ``pretrain.checkpoint_manager``).
"""

from __future__ import annotations

from typing import Optional

from pretrain.bias_balancing import BiasBalancer, routing_biases, update_rate
from pretrain.registry import implementation_for
from pretrain.routing import RouterWatch


class MoETraining:
    """The router watch of a mixture-of-experts model and, for DeepSeek-V3, its bias balancer.

    Args:
        router_watch: the model's ``RouterWatch`` (its routers' forward hooks are installed).
        bias_update_rate: ``moe_bias_update_rate`` as given (None: the model's default; 0: no balancing).
    """

    def __init__(self, router_watch: RouterWatch, bias_update_rate: Optional[float]):
        self.router_watch = router_watch
        # DeepSeek-V3: its routing biases move toward balance after each applied step (None: no bias or rate 0)
        self.bias_balancer: Optional[BiasBalancer] = None
        biases = routing_biases(router_watch.routers)
        rate = update_rate(bias_update_rate, bool(biases))
        if biases and rate > 0:
            self.bias_balancer = BiasBalancer(biases, rate)
            router_watch.bias_update_rate = rate

    @classmethod
    def of(cls, model, bias_update_rate: Optional[float]) -> Optional["MoETraining"]:
        """The MoE training of ``model`` (its paddlenlp ``config``'s model type routes tokens), else None."""
        config = getattr(model, "config", None)
        routing = implementation_for(config.model_type).routing if config is not None else None
        if routing is None:
            return None
        return cls(RouterWatch(model, routing, config), bias_update_rate)

    def add_aux_loss(self, forward, return_outputs: bool):
        """Run ``forward()`` (paddlenlp's ``compute_loss``: a loss, or ``(loss, outputs)`` with
        ``return_outputs``) and add ``aux_loss_coef`` x the load-balancing loss of its routers to the loss."""
        watch = self.router_watch
        watch.begin()
        result = forward()
        aux = watch.take(result[0] if return_outputs else result)
        if aux is None:
            return result
        loss = (result[0] if return_outputs else result) + watch.aux_loss_coef * aux
        return (loss, result[1]) if return_outputs else loss

    def after_step(self, applied: bool, world_size: int) -> None:
        """Once per optimizer step, on every rank (the loads are a collective): the bias update of an applied
        step."""
        if self.bias_balancer is None:
            return
        loads = self.router_watch.step_loads(world_size)
        if applied:
            self.bias_balancer.update(loads)

    def record(self, step: int, world_size: int) -> dict:
        """The routing figures of a training log record (a collective on several ranks)."""
        return self.router_watch.record(step, world_size)

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        self.router_watch.restore(checkpoint_folder)

    def write(self, folder: str) -> None:
        self.router_watch.write(folder)
