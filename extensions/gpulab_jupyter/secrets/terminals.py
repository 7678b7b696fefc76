"""Terminals get the secrets of the person who opens them (deliver.py).

jupyter_server_terminals makes its terminal manager from a class that is not
configurable, so the server extension gives the manager it made a subclass of its
own class that adds them to each new terminal's environment
(:func:`deliver_to_terminals`)."""

from __future__ import annotations

from gpulab_jupyter.secrets import deliver


class _DeliversSecrets:
    gpulab_delivers_secrets = True

    def make_term_env(self, *args, **kwargs):
        env = super().make_term_env(*args, **kwargs)
        return deliver.with_secrets(env, deliver.current.get())


def deliver_to_terminals(settings) -> bool:
    """Make the server's terminal manager (``settings["terminal_manager"]``) add the
    starter's secrets; whether it was changed now (False: none yet, or done)."""
    manager = settings.get("terminal_manager")
    if manager is None or getattr(manager, "gpulab_delivers_secrets", False):
        return False
    cls = type(manager)
    manager.__class__ = type(cls.__name__, (_DeliversSecrets, cls), {"__module__": __name__})
    return True
