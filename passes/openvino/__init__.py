"""OpenVINO passes: conversion to IR and NNCF post-training compression (quantization with or
without accuracy control, weight compression). Their outputs run on the ``openvino`` target."""
