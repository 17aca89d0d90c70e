"""paddlenlp's enum-valued arguments (``IntervalStrategy``, ``SchedulerType``, ``ShardingOption``, ...) as
plain values: after parsing they are enums, in a JSON file or a default they are strings."""


def plain(value):
    """An enum's ``.value``, anything else unchanged: ``IntervalStrategy.STEPS`` -> ``"steps"``."""
    return getattr(value, "value", value)
