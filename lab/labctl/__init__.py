"""labctl: the local multi-node test bed behind `lab/lab` (systemd-nspawn nodes on a private bridge)."""
