"""The cluster's certificates: one CA signs the apiserver's serving certificate, a client certificate per
component (its Kubernetes identity is the subject: CN = user, O = group), the kubelet's serving
certificate and the service-account signing key.  ECDSA P-256 through the openssl CLI: fast to make,
so a fresh set is made on every `up`."""

from __future__ import annotations

import base64
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class CertRequest:
    name: str  # file stem under the PKI dir
    common_name: str
    organization: str | None = None
    client: bool = True
    server: bool = False
    sans: tuple[str, ...] = ()  # "IP:1.2.3.4" / "DNS:name"


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.decode(errors='replace')}")
    return result.stdout


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)


def make_ca(pki: Path) -> None:
    _new_key(pki / "ca.key")
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(pki / "ca.key"),
        "-subj",
        "/CN=kubeinfer-ca",
        "-days",
        "3650",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out",
        str(pki / "ca.crt"),
    )


def issue(pki: Path, req: CertRequest) -> None:
    key, crt, ext = pki / f"{req.name}.key", pki / f"{req.name}.crt", pki / f"{req.name}.ext"
    _new_key(key)
    subject = (f"/O={req.organization}" if req.organization else "") + f"/CN={req.common_name}"
    csr = _openssl("req", "-new", "-key", str(key), "-subj", subject)
    usages = [u for u, on in (("clientAuth", req.client), ("serverAuth", req.server)) if on]
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(usages)}",
    ]
    if req.sans:
        lines.append(f"subjectAltName={','.join(req.sans)}")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "/dev/stdin",
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-set_serial",
        str(int.from_bytes(os.urandom(8), "big")),
        "-days",
        "3650",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
        stdin=csr,
    )
    ext.unlink()


def make_service_account_key(pki: Path) -> None:
    _new_key(pki / "sa.key")
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def write_kubeconfig(path: Path, server: str, pki: Path, name: str, user: str) -> None:
    """A self-contained kubeconfig (certificates embedded) for the client certificate `name`."""

    def b64(file: str) -> str:
        return base64.b64encode((pki / file).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "kubeinfer", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(f"{name}.crt"),
                    "client-key-data": b64(f"{name}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "kubeinfer", "context": {"cluster": "kubeinfer", "user": user, "namespace": "default"}}
        ],
        "current-context": "kubeinfer",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
