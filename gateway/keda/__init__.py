"""KEDA's external-scaler contract (`externalscaler.proto`) and the Python modules
generated from it by `generate.sh`; the gateway's servicer is `gateway.keda_scaler`."""
