"""What the probe reads from the machine: /sys and /proc, NVML, psutil."""
