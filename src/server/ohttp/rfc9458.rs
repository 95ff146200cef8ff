//! RFC 9458 Appendix A, reproduced byte for byte on the HPKE layer (the `hpke` crate: the
//! `ohttp` crate takes neither a fixed private key nor a fixed response nonce), and the
//! gateway's `ohttp` crate checked against that construction in both directions.

use hpke::aead::AesGcm128;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use ring::{aead, hkdf};

use super::GatewayKey;

const SK_R: &str = "3c168975674b2fa8e465970b79c8dcf09f1c741626480bd4c6162fc5b6a98e1a";
const KEY_CONFIG: &str =
    "01002031e1f05a740102115220e9af918f738674aec95f54db6e04eb705aae8e79815500080001000100010003";
const REQUEST: &str = "00034745540568747470730b6578616d706c652e636f6d012f";
const INFO: &str = "6d6573736167652f626874747020726571756573740001002000010001";
const ENCAPSULATED_REQUEST: &str = concat!(
    "010020000100014b28f881333e7c164ffc499ad9796f877f4e1051ee6d31bad1",
    "9dec96c208b4726374e469135906992e1268c594d2a10c695d858c40a026e796",
    "5e7d86b83dd440b2c0185204b4d63525",
);
const RESPONSE: &str = "0140c8";
const EXPORTED_SECRET: &str = "62d87a6ba569ee81014c2641f52bea36";
const RESPONSE_NONCE: &str = "c789e7151fcba46158ca84b04464910d";
const ENCAPSULATED_RESPONSE: &str =
    "c789e7151fcba46158ca84b04464910d86f9013e404feea014e7be4a441f234f857fbd";

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

/// The request `info` of RFC 9458 §4.3 for a request header (key id, KEM, KDF, AEAD).
fn request_info(header: &[u8]) -> Vec<u8> {
    [b"message/bhttp request\0".as_slice(), header].concat()
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// RFC 9458 §4.4: the response's AEAD key and nonce from the exported secret, `enc` and the
/// response nonce (HKDF-SHA256, AES-128-GCM sizes).
fn response_aead(secret: &[u8], enc: &[u8], response_nonce: &[u8]) -> (Vec<u8>, [u8; 12]) {
    let salt = [enc, response_nonce].concat();
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(secret);
    let mut key = vec![0; 16];
    prk.expand(&[b"key"], Len(16))
        .unwrap()
        .fill(&mut key)
        .unwrap();
    let mut nonce = [0; 12];
    prk.expand(&[b"nonce"], Len(12))
        .unwrap()
        .fill(&mut nonce)
        .unwrap();
    (key, nonce)
}

fn seal_response(secret: &[u8], enc: &[u8], response_nonce: &[u8], response: &[u8]) -> Vec<u8> {
    let (key, nonce) = response_aead(secret, enc, response_nonce);
    let key = aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_128_GCM, &key).unwrap());
    let mut sealed = response.to_vec();
    key.seal_in_place_append_tag(
        aead::Nonce::assume_unique_for_key(nonce),
        aead::Aad::empty(),
        &mut sealed,
    )
    .unwrap();
    [response_nonce, &sealed].concat()
}

fn open_response(secret: &[u8], enc: &[u8], sealed: &[u8]) -> Vec<u8> {
    let (response_nonce, ciphertext) = sealed.split_at(16);
    let (key, nonce) = response_aead(secret, enc, response_nonce);
    let key = aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_128_GCM, &key).unwrap());
    let mut buffer = ciphertext.to_vec();
    key.open_in_place(
        aead::Nonce::assume_unique_for_key(nonce),
        aead::Aad::empty(),
        &mut buffer,
    )
    .unwrap()
    .to_vec()
}

#[test]
fn appendix_a_request_opens_and_response_seals_to_its_bytes() {
    let sealed = unhex(ENCAPSULATED_REQUEST);
    let (header, rest) = sealed.split_at(7);
    let (enc, ciphertext) = rest.split_at(32);
    assert_eq!(request_info(header), unhex(INFO));
    let sk = <X25519HkdfSha256 as Kem>::PrivateKey::from_bytes(&unhex(SK_R)).unwrap();
    // The key configuration's public key is the private key's.
    let pk = <X25519HkdfSha256 as Kem>::sk_to_pk(&sk);
    assert_eq!(pk.to_bytes().to_vec(), unhex(KEY_CONFIG)[3..35]);
    let encapped = <X25519HkdfSha256 as Kem>::EncappedKey::from_bytes(enc).unwrap();
    let mut context = hpke::setup_receiver::<AesGcm128, HkdfSha256, X25519HkdfSha256>(
        &OpModeR::Base,
        &sk,
        &encapped,
        &request_info(header),
    )
    .unwrap();
    assert_eq!(context.open(ciphertext, b"").unwrap(), unhex(REQUEST));
    let mut secret = [0; 16];
    context
        .export(b"message/bhttp response", &mut secret)
        .unwrap();
    assert_eq!(hex::encode(secret), EXPORTED_SECRET);
    let response = seal_response(&secret, enc, &unhex(RESPONSE_NONCE), &unhex(RESPONSE));
    assert_eq!(hex::encode(&response), ENCAPSULATED_RESPONSE);
    assert_eq!(open_response(&secret, enc, &response), unhex(RESPONSE));
}

#[test]
fn the_gateway_opens_what_the_rfc_construction_seals_and_back() {
    let key = GatewayKey::generate().unwrap();
    let pk = <X25519HkdfSha256 as Kem>::PublicKey::from_bytes(&key.public_key()).unwrap();
    // Header: the gateway's key id, X25519 (0x0020), HKDF-SHA256 (1), AES-128-GCM (1).
    let header = [key.key_id(), 0x00, 0x20, 0x00, 0x01, 0x00, 0x01];
    let (encapped, mut context) = hpke::setup_sender::<AesGcm128, HkdfSha256, X25519HkdfSha256, _>(
        &OpModeS::Base,
        &pk,
        &request_info(&header),
        &mut rand::rng(),
    )
    .unwrap();
    let enc = encapped.to_bytes().to_vec();
    let ciphertext = context.seal(&unhex(REQUEST), b"").unwrap();
    let sealed = [header.as_slice(), &enc, &ciphertext].concat();

    let (plain, responder) = key.server().decapsulate(&sealed).unwrap();
    assert_eq!(plain, unhex(REQUEST));
    let sealed_response = responder.encapsulate(&unhex(RESPONSE)).unwrap();
    let mut secret = [0; 16];
    context
        .export(b"message/bhttp response", &mut secret)
        .unwrap();
    assert_eq!(
        open_response(&secret, &enc, &sealed_response),
        unhex(RESPONSE)
    );

    // One byte flipped anywhere in the ciphertext or enc: the gateway cannot open it.
    for at in [8, sealed.len() - 1] {
        let mut flipped = sealed.clone();
        flipped[at] ^= 1;
        assert!(key.server().decapsulate(&flipped).is_err(), "byte {at}");
    }
}
