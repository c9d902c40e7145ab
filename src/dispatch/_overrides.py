"""kubectl's generic client flags as the library takes them (a module of its own, so that the command line
builds them without loading the HTTP client)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigOverrides:
    """kubectl's generic client flags, laid over the kubeconfig as kubectl lays them (client-go's
    ``ConfigOverrides``), so that ``--server``, ``--token`` or ``--as`` mean in dispatch what they mean in
    kubectl. None (or empty) leaves the kubeconfig's value.

    * ``cluster`` and ``user`` (``--cluster``, ``--user``): the kubeconfig's cluster or user entry to use
      instead of the context's.
    * ``server``, ``certificate_authority`` (a file), ``insecure_skip_tls_verify``, ``tls_server_name``: the
      cluster's. A CA or ``insecure_skip_tls_verify=True`` replaces the kubeconfig's CA and its skip setting
      together; a ``server`` given without ``tls_server_name`` drops the kubeconfig's server name (both as
      kubectl).
    * ``token`` (``--token``): the bearer token, in place of the user's token, token file, exec plugin or
      password (a client certificate stays).
    * ``impersonate``, ``impersonate_groups``, ``impersonate_uid`` (``--as``, ``--as-group``, ``--as-uid``):
      act as that user, sent as the ``Impersonate-User``, ``Impersonate-Group`` and ``Impersonate-Uid``
      headers; they replace a kubeconfig user's ``as``, ``as-groups`` and ``as-uid``. Groups or a uid without a
      user are refused, as kubectl refuses them.
    """

    cluster: str | None = None
    user: str | None = None
    server: str | None = None
    token: str | None = None
    certificate_authority: str | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    impersonate: str | None = None
    impersonate_groups: tuple[str, ...] = ()
    impersonate_uid: str | None = None
