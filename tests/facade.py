"""One test body for both stores: an async thread's methods run to completion on a loop."""


class SyncFacade:
    """Runs an async thread's methods to completion so one test body serves both modes."""

    def __init__(self, thread, loop):
        self._thread = thread
        self._loop = loop

    def __getattr__(self, name):
        attr = getattr(self._thread, name)
        if name == "iter":
            def collect(*args, **kwargs):
                async def gather():
                    return [m async for m in attr(*args, **kwargs)]
                return iter(self._loop.run_until_complete(gather()))
            return collect
        if callable(attr):
            def call(*args, **kwargs):
                return self._loop.run_until_complete(attr(*args, **kwargs))
            return call
        return attr
