"""Turning NVML's raw values into the device model's words: enum names, bus ids, versions."""

from __future__ import annotations

# NVML_BRAND_* -> name (as NVIDIA's own DRA driver publishes the brand attribute).
BRAND_NAMES: dict[int, str] = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
    12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}

# NVML_DEVICE_ARCH_* -> name.
ARCHITECTURE_NAMES: dict[int, str] = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin",
}


def text(value: str | bytes) -> str:
    """A struct field's string (a bus id, a profile name) arrives as ``bytes``; pynvml's decorated calls
    (UUID, name, driver version) already give ``str``, so discovery reads those as they come."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def brand_name(value: int | None) -> str:
    """``14`` -> ``"Nvidia"``; unknown values keep their number so nothing is silently dropped."""
    if value is None:
        return "Unknown"
    return BRAND_NAMES.get(value, f"Brand{value}")


def architecture_name(value: int | None) -> str:
    """``9`` -> ``"Hopper"``."""
    if value is None:
        return "Unknown"
    return ARCHITECTURE_NAMES.get(value, "Unknown")


def normalise_pci_bus_id(bus_id: str | bytes) -> str:
    """``"00000000:00:06.0"`` (NVML) -> ``"0000:00:06.0"`` (sysfs and Kubernetes' pciBusID form)."""
    raw = text(bus_id).strip().lower()
    parts = raw.split(":")
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    domain, bus, rest = parts
    device, function = rest.split(".", 1)
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"


def cuda_version(value: int) -> str:
    """``13000`` -> ``"13.0"``, ``12040`` -> ``"12.4"`` (NVML's CUDA_VERSION encoding)."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def profile_name(nvml_name: str | bytes) -> str:
    """``"MIG 1g.18gb"`` -> ``"1g.18gb"``."""
    return text(nvml_name).strip().removeprefix("MIG ").strip()
