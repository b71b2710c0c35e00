//! Typed ids on the wire: device addresses and the handles a client mints (contexts, streams,
//! events, modules, functions, VMM physical memory, texture objects) are distinct types, so a
//! stream cannot be passed where an address belongs. Each is a `u64` and encodes as one
//! (`#[serde(transparent)]`): the bytes on the wire are those of the plain integer, which the
//! golden-bytes tests pin.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! wire_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize,
            Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The value as the driver API and the wire carry it.
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        /// The integer, as it printed before it was typed (`{:#x}` for hexadecimal).
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

wire_id!(
    /// A device address in the session's window (`CUdeviceptr`).
    DevicePtr
);
wire_id!(
    /// A context the client minted (`CUcontext`).
    ContextHandle
);
wire_id!(
    /// A stream the client minted; 0 is the default stream.
    StreamHandle
);
wire_id!(
    /// An event the client minted (`CUevent`).
    EventHandle
);
wire_id!(
    /// A module the client minted (`CUmodule`).
    ModuleHandle
);
wire_id!(
    /// A kernel function the client minted (`CUfunction`).
    FunctionHandle
);
wire_id!(
    /// Physical memory of the virtual memory management API (`CUmemGenericAllocationHandle`).
    PhysicalHandle
);
wire_id!(
    /// A session: the node's id for it, or the pool's where a controller is asked (the
    /// message says which).
    SessionId
);
wire_id!(
    /// A texture or surface object (`CUtexObject`, `CUsurfObject`): the value kernels get.
    TexHandle
);

impl DevicePtr {
    /// The address `offset` bytes further on, `None` past the end of the address space.
    pub fn checked_add(self, offset: u64) -> Option<Self> {
        self.0.checked_add(offset).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_encodes_as_its_integer() {
        let p = DevicePtr(0x7f00_0000_1234);
        let typed = postcard::to_allocvec(&p).unwrap();
        assert_eq!(typed, postcard::to_allocvec(&0x7f00_0000_1234u64).unwrap());
        assert_eq!(postcard::from_bytes::<DevicePtr>(&typed).unwrap(), p);
        assert_eq!(p.to_string(), "139637976732212");
        assert_eq!(format!("{p:#x}"), "0x7f0000001234");
        assert_eq!(SessionId(17).to_string(), "17");
        assert_eq!(StreamHandle::default().get(), 0);
    }
}
